// The loss of docs/semantics.md section 4.
int main() { return 0; }
