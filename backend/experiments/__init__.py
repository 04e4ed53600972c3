"""Paper reproductions: each module has main(out_dir, quick=False) writing tables and plots."""
