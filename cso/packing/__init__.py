"""Packing: filters into panels, inputs into zero-padded window panels."""
