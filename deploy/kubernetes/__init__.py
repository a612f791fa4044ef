"""The Kubernetes manifests: ``settings.py`` the table, ``build.py`` the objects and files."""
