"""Kubernetes' rules for names (apimachinery's validation), in one place.

The patterns are plain strings so that the CRD's CEL rules can be built from
the very same text (``matches()``; policy.models builds them).
"""

from __future__ import annotations

import re

# A DNS-1123 label: a namespace, a Service name.
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_MAX_LENGTH = 63
# A DNS-1123 subdomain: a Secret, a Lease, a PriorityClass; a label key's prefix.
DNS_SUBDOMAIN = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
DNS_SUBDOMAIN_MAX_LENGTH = 253
# A label key's name part (after the optional prefix and '/').
QUALIFIED_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


def is_dns_label(text: str) -> bool:
    return len(text) <= DNS_LABEL_MAX_LENGTH and re.fullmatch(DNS_LABEL, text) is not None


def is_dns_subdomain(text: str) -> bool:
    return len(text) <= DNS_SUBDOMAIN_MAX_LENGTH and re.fullmatch(DNS_SUBDOMAIN, text) is not None
