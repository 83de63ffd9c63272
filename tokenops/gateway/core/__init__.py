"""The request pipeline every API shares: admission, the plugin hook steps, routing to replicas, the record of each request."""
