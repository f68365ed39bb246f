"""Result tables, by name: importing this package registers every table."""
