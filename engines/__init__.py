"""Everything about engines: adapters per engine kind, launch specs, meters, the simulator."""
