"""What a run is made of, before anything loads: presets and settings, the plugin interface and registries, model
and data references, and the one error type users see."""
