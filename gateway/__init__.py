"""The public HTTP API: function CRUD, invocation, routing and cold-start queueing."""
