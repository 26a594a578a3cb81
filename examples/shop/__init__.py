"""The shop example: a place-order saga over fake inventory, payment and shipping providers."""
