"""From stored runs to what people read: the paper's tables and figures, and the HTML report, from the metrics each
run stored (``harness.cell.metrics``). Nothing here loads a model."""
