"""Generated bindings for the bigfleet.v1alpha1 wire contracts (``make proto``)."""
