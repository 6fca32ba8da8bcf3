"""Layer 6: the torch adapter, the only layer that speaks torch.distributed.

In it: the ProcessGroup backend, its Work objects and threads, staging, the store, init-method
handlers, torchrun's rendezvous backend, registration.
"""
