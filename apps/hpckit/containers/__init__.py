"""Container recipes (Apptainer definition files and Dockerfiles) generated from one source."""
