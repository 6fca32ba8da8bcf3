"""Layer 6: the torch adapter: the ProcessGroup backend, its Work objects and threads, staging, the
store, init-method handlers, torchrun's rendezvous backend, registration. The only layer that
speaks torch.distributed.
"""
