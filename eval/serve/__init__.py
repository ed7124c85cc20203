"""Serving a trained controller to the Udacity simulator over its Socket.IO protocol."""
