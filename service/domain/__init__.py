"""The domain: pure rules about authorizations. Imports no I/O library (see STYLE: inward)."""
