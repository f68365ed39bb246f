"""Figures of the papers (PNG), one stage module each (e.g. ``caprl attention-figure``)."""
