"""The graph pass (CustomGraphPass) and its installation into Inductor, the backend, the report; one
lowering per pattern family (``indexer``: dense, paged and tensor-parallel indexer; ``attention``)."""
from .graph_pass import IndexerPass, run, source_hash
from .install import PASS, backend, enabled, graph_only_backend, install, is_installed, uninstall
from .report import counters, report, reset

__all__ = ["IndexerPass", "PASS", "backend", "enabled", "graph_only_backend", "install", "is_installed", "uninstall",
           "report", "reset", "counters", "run", "source_hash"]
