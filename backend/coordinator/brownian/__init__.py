"""Intermittent streams with Brownian models (Zhu & Ravishankar 2004): deferral, interruptions, scheduling."""
