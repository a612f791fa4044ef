"""Scripts run from a checkout; a package only so that tests can import their logic."""
