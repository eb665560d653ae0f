"""One run's steps in order: the spec's arguments parsed and checked before the stack loads,
then devices, model, data, the backend's trainer, eval and the result (``train``)."""
