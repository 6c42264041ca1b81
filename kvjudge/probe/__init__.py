"""kvjudge.probe"""
