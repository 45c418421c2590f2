"""Replicas on Ray Serve (the `cluster` extra): the affinity policy (`affinity`, pure, no Ray), the request
router (`router`), the deployment and its HTTP relay (`ray`, `relay`). Importing this package loads none of them."""
