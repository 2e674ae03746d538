"""Framework workers, one module each, registered with the engine by framework name."""
