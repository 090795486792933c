"""Who may do what: access levels, credentials, client addresses."""
