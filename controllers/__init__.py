"""Controllers: attention layers (NSAC, NAC, Lévy), their uncertainty outputs, and the metrics
every comparison uses. Image encoders and full controllers build on these."""
