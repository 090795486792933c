"""The engine: one certificate, one codec registry, one UDP port, viewer sessions."""
