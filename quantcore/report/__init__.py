"""The report: plain JSON values (``document``) and the same report as a standalone page (``html``)."""
