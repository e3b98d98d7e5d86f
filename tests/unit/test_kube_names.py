"""Kubernetes' name rules as apimachinery states them (IsDNS1123Label/Subdomain)."""

import pytest

from stalledpolicy.kube_names import is_dns_label, is_dns_subdomain


@pytest.mark.parametrize("name, label, subdomain", [
    ("a", True, True),
    ("team-a", True, True),
    ("0x9", True, True),
    ("a" * 63, True, True),
    ("a" * 64, False, True),
    ("a.b", False, True),
    (".".join(["a" * 63] * 4)[:253], False, True),
    ("a" * 254, False, False),
    ("", False, False),
    ("Team", False, False),
    ("-a", False, False),
    ("a-", False, False),
    ("a..b", False, False),
    ("a_b", False, False),
])
def test_label_and_subdomain(name, label, subdomain):
    assert is_dns_label(name) is label
    assert is_dns_subdomain(name) is subdomain
