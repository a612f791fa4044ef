"""The Kubernetes manifests: ``build.py`` writes them from the Kubernetes section of the
pack's table (``pack.settings.KubeSettings``); ``objects.py`` and ``components.py``
build the objects."""
