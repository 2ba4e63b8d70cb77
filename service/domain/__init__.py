"""The domain: pure rules about authorizations. Imports no I/O library, no metrics and no
logging set-up: dependencies point inward (ARCHITECTURE.md, "Which way the imports point")."""
