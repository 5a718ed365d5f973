"""Energy meters: cumulative joules per GPU with a timestamp, one module per meter kind."""
