"""The MoEDeployment API's identity: group, version, kind and resource names."""

GROUP = "moe.inference.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MoEDeployment"
LIST_KIND = "MoEDeploymentList"
PLURAL = "moedeployments"
SINGULAR = "moedeployment"
SHORT_NAMES = ("moed",)
CATEGORIES = ("moe",)
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILENAME = f"{CRD_NAME}.yaml"

MAX_NAME_LENGTH = 40
"""Children append suffixes such as ``-decode-12`` and pod ordinals; 63-character limits
(label values, DNS labels, StatefulSet revision hashes) leave 40 for the object's name."""
