"""kvjudge.judge"""
