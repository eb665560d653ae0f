"""What a run is set to do: the setting types it is parsed into, and each setting under
the name the installed libraries take it by."""
