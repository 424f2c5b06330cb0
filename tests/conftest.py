"""Shared pytest configuration."""

from tests.kubeenv.fixtures import *  # noqa: F403  (real kube-apiserver fixtures)
