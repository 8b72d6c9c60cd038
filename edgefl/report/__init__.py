"""Figures and tables from run directories."""
