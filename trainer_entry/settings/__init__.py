"""What a run is asked to do: its spec's arguments parsed, checked before the stack loads, and named as the installed libraries name them."""
