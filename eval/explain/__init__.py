"""Explaining a closed-loop evaluation: Grad-CAM, neuron-level potentials, the HTML report."""
