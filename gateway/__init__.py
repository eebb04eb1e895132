"""The gateway: see README.md. Importing it first checks that compiled modules, if any, are current."""

from gateway.native import guard

guard()
