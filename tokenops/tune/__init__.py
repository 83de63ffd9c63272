"""SLO-driven tuning: search the tunables registry for the configuration with the highest goodput."""
