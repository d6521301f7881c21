"""From stored runs to numbers people read: metrics, the paper's tables and figures. Nothing here loads a model."""
