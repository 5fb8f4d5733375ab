"""`make demo`: import the bundled example model and run it on the reference interpreter."""
