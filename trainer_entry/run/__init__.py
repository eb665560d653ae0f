"""One run's steps in order: devices and engine, model, data, the backend's trainer, eval, the result."""
