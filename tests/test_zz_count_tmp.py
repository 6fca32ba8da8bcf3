def test_count(pool_factory) -> None:
    from in_rank import collectives

    small, large = pool_factory(2).run(collectives.files_an_all_reduce_enters, [2, 4 << 20])[0]
    print("\nSMALL", len(small), small, "\nLARGE", len(large), large)
