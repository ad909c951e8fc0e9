"""tilelang"""
