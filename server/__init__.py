"""HTTP serving of the QA model (FastAPI + uvicorn)."""
