"""diagnose"""
