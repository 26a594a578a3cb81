"""Engine behaviour tests: sagas driven in-process on the memory store."""
