"""Deployment files of the checkout; ``deploy.kubernetes`` generates the Kubernetes manifests."""
