"""A real etcd + kube-apiserver for the test suite, the way controller authors use envtest.

See tools/kube-bins/README.md. Fixtures live in tests/kubeenv/fixtures.py; import each name from its
module (binaries, env, server), which defines it.
"""
