"""kvjudge.retention"""
