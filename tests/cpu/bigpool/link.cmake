# The pool maps 2.15 GB (lazily backed): run this suite alone.
set(suite_test_properties RUN_SERIAL TRUE)
