"""OpenFold (MLPerf HPC v3.0): AlphaFold2's structure prediction trained from a fixed checkpoint
on PDB chains with OpenProteinSet's alignments, to an average lDDT-Ca on the CAMEO targets."""
