# the node fixtures of tests/integration (start_node, node), for tests here that need real nodes
from tests.integration.conftest import node, start_node  # noqa: F401
