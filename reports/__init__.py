"""One report model rendered as JSON, SARIF 2.1.0, HTML and terminal summaries."""
