"""Cases that run inside rank processes (harness.RankPool sends each to every rank by name),
returning what the tests in the parent assert on. Nothing here is collected by pytest."""
