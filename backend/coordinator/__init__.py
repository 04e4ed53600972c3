"""Sans-IO server algorithms: a generic core package and one package per technique (DESIGN.md §2)."""
