# spade: domain=tool_use skill=error-recovery
"""Online banking: pay a bill, pay a new recipient, rebalance accounts and freeze a lost card.
The natural first call often fails (short balance, unregistered payee, transfer limit); the error
says why, and the fix is another tool call before retrying."""

import json

NAMES = ["Greta Holm", "Samir Aziz", "Lucia Ferri", "Owen Price", "Hanna Berg", "Kwame Mensah"]
BILLERS = ["electricity", "water", "internet", "phone"]
LIMITS = {"standard": 50000, "high": 200000, "max": 500000}


def _cents(amount):
    if isinstance(amount, bool) or not isinstance(amount, (int, float, str)):
        raise ValueError("amount must be a number")
    try:
        value = round(float(amount) * 100)
    except ValueError:
        raise ValueError(f"amount '{amount}' is not a number")
    if not 0 < value < 10 ** 9:
        raise ValueError("amount must be positive")
    return value


def _money(cents):
    return f"${cents / 100:.2f}"


class BankTransfersEnv(ToolUseBaseEnv):
    max_turns = 18

    def setup(self):
        rng = self.rng
        checking = f"CHK-{rng.randint(1000, 9999)}"
        savings = f"SAV-{rng.randint(1000, 9999)}"
        card = f"CARD-{rng.randint(1000, 9999)}"
        biller = rng.choice(BILLERS)
        bill = rng.randint(80, 240) * 100 + rng.choice([0, 50, 99])
        start_checking = bill - rng.randint(20, 70) * 100
        landlord = rng.choice(NAMES)
        iban = "DE" + "".join(str(rng.randint(0, 9)) for _ in range(20))
        rent = rng.randint(6, 14) * 10000
        final = rng.randint(3, 9) * 10000
        start_savings = (bill - start_checking) + rent + final + rng.randint(5, 40) * 1000
        payee_id = f"P-{rng.randint(100, 999)}"
        self.state = {
            "accounts": {checking: {"type": "checking", "balance": start_checking},
                         savings: {"type": "savings", "balance": start_savings}},
            "cards": {card: {"linked_to": checking, "status": "active", "reason": None}},
            "payees": {},
            "next_payee_id": payee_id,
            "limit": "standard",
            "bill_payments": [],
            "sent": [],
            "internal": [],
        }
        self.instructions = [
            f"Please pay my {biller} bill of {_money(bill)} from my checking account.",
            f"Next, send {_money(rent)} rent from my savings account to my landlord "
            f"{landlord} (IBAN {iban}).",
            f"Now move money between my own accounts so that my checking account holds "
            f"exactly {_money(final)}.",
            "Last thing: I lost my debit card. Freeze it.",
        ]
        self.criteria = [
            lambda s: [(p["biller"], p["amount"]) for p in s["bill_payments"]] == [(biller, bill)],
            lambda s: [(x["iban"], x["amount"]) for x in s["sent"]] == [(iban, rent)],
            lambda s: s["accounts"][checking]["balance"] == final,
            lambda s: s["cards"][card]["status"] == "frozen" and s["cards"][card]["reason"] == "lost",
        ]
        short = bill - start_checking
        self._plan = [
            ("get_accounts", {}),
            ("transfer_between_accounts", {"from_account": savings, "to_account": checking,
                                           "amount": short / 100}),
            ("pay_bill", {"account_id": checking, "biller": biller, "amount": bill / 100}),
            ("add_payee", {"name": landlord, "iban": iban}),
            ("set_transfer_limit", {"level": "high"}),
            ("send_money", {"from_account": savings, "payee_id": payee_id, "amount": rent / 100}),
            ("transfer_between_accounts", {"from_account": savings, "to_account": checking,
                                           "amount": final / 100}),
            ("freeze_card", {"card_id": card, "reason": "lost"}),
        ]
        account = {"type": "string", "description": "account id, e.g. CHK-1234"}
        amount = {"type": "number", "description": "amount in dollars"}
        self.tools = {
            "get_accounts": {
                "description": "List the customer's accounts with balances, and their cards.",
                "parameters": {"type": "object", "properties": {}, "required": []}},
            "pay_bill": {
                "description": "Pay a utility bill from an account.",
                "parameters": {"type": "object", "properties": {
                    "account_id": account, "biller": {"type": "string", "enum": BILLERS},
                    "amount": amount}, "required": ["account_id", "biller", "amount"]}},
            "transfer_between_accounts": {
                "description": "Move money between two of the customer's own accounts.",
                "parameters": {"type": "object", "properties": {
                    "from_account": account, "to_account": account, "amount": amount},
                    "required": ["from_account", "to_account", "amount"]}},
            "add_payee": {
                "description": "Register an external recipient; returns a payee id.",
                "parameters": {"type": "object", "properties": {
                    "name": {"type": "string"}, "iban": {"type": "string"}},
                    "required": ["name", "iban"]}},
            "send_money": {
                "description": "Send money from an account to a registered payee. Subject to the "
                               "daily transfer limit.",
                "parameters": {"type": "object", "properties": {
                    "from_account": account, "payee_id": {"type": "string"}, "amount": amount},
                    "required": ["from_account", "payee_id", "amount"]}},
            "set_transfer_limit": {
                "description": "Change the daily limit for payments to external payees.",
                "parameters": {"type": "object", "properties": {
                    "level": {"type": "string", "enum": sorted(LIMITS)}},
                    "required": ["level"]}},
            "freeze_card": {
                "description": "Freeze a card so it cannot be used, giving the reason.",
                "parameters": {"type": "object", "properties": {
                    "card_id": {"type": "string"},
                    "reason": {"type": "string", "enum": ["lost", "stolen", "damaged"]}},
                    "required": ["card_id", "reason"]}},
            "request_statement": {
                "description": "Email a monthly statement for an account.",
                "parameters": {"type": "object", "properties": {
                    "account_id": account, "month": {"type": "string"}},
                    "required": ["account_id", "month"]}},
        }

    # -- helpers ------------------------------------------------------------------------------
    def _account(self, account_id):
        acct = self.state["accounts"].get(str(account_id))
        if acct is None:
            raise ValueError(f"unknown account '{account_id}'. Call get_accounts to see ids.")
        return acct

    def _debit(self, account_id, cents):
        acct = self._account(account_id)
        if acct["balance"] < cents:
            raise ValueError(f"insufficient funds: {account_id} holds {_money(acct['balance'])} "
                             f"but {_money(cents)} is needed")
        acct["balance"] -= cents

    # -- tools --------------------------------------------------------------------------------
    def tool_get_accounts(self):
        accounts = [{"account_id": k, "type": v["type"], "balance": _money(v["balance"])}
                    for k, v in sorted(self.state["accounts"].items())]
        cards = [{"card_id": k, "linked_to": v["linked_to"], "status": v["status"]}
                 for k, v in sorted(self.state["cards"].items())]
        return json.dumps({"accounts": accounts, "cards": cards,
                           "transfer_limit": self.state["limit"]})

    def tool_pay_bill(self, account_id, biller, amount):
        if biller not in BILLERS:
            return f"Error: unknown biller '{biller}'."
        cents = _cents(amount)
        self._debit(account_id, cents)
        self.state["bill_payments"].append({"biller": biller, "amount": cents,
                                            "account": account_id})
        return f"Paid {_money(cents)} to {biller} from {account_id}."

    def tool_transfer_between_accounts(self, from_account, to_account, amount):
        if from_account == to_account:
            return "Error: the two accounts must differ."
        self._account(to_account)
        cents = _cents(amount)
        self._debit(from_account, cents)
        self.state["accounts"][to_account]["balance"] += cents
        self.state["internal"].append([from_account, to_account, cents])
        return (f"Moved {_money(cents)} from {from_account} to {to_account}. Balances: "
                + ", ".join(f"{k} {_money(v['balance'])}"
                            for k, v in sorted(self.state["accounts"].items())))

    def tool_add_payee(self, name, iban):
        iban = str(iban).replace(" ", "").upper()
        if len(iban) < 15 or not iban[:2].isalpha() or not iban[2:].isdigit():
            return "Error: that IBAN is not valid."
        for pid, p in self.state["payees"].items():
            if p["iban"] == iban:
                return json.dumps({"payee_id": pid, "note": "already registered"})
        pid = self.state["next_payee_id"]
        if pid in self.state["payees"]:
            pid = f"P-{len(self.state['payees']) + 1000}"
        self.state["payees"][pid] = {"name": str(name), "iban": iban}
        return json.dumps({"payee_id": pid, "name": str(name)})

    def tool_send_money(self, from_account, payee_id, amount):
        payee = self.state["payees"].get(str(payee_id))
        if payee is None:
            return (f"Error: '{payee_id}' is not a registered payee id. Register the recipient "
                    "with add_payee first.")
        self._account(from_account)
        cents = _cents(amount)
        limit = LIMITS[self.state["limit"]]
        if cents > limit:
            return (f"Error: {_money(cents)} exceeds the daily transfer limit of {_money(limit)} "
                    f"(level '{self.state['limit']}').")
        self._debit(from_account, cents)
        self.state["sent"].append({"payee_id": payee_id, "iban": payee["iban"], "amount": cents})
        return f"Sent {_money(cents)} to {payee['name']} ({payee_id})."

    def tool_set_transfer_limit(self, level):
        if level not in LIMITS:
            return f"Error: level must be one of {sorted(LIMITS)}."
        self.state["limit"] = level
        return f"Daily transfer limit set to {_money(LIMITS[level])} ({level})."

    def tool_freeze_card(self, card_id, reason):
        card = self.state["cards"].get(str(card_id))
        if card is None:
            return f"Error: unknown card '{card_id}'."
        if reason not in ("lost", "stolen", "damaged"):
            return "Error: reason must be lost, stolen or damaged."
        if card["status"] == "frozen":
            return "Error: the card is already frozen."
        card["status"], card["reason"] = "frozen", reason
        return f"Card {card_id} frozen ({reason})."

    def tool_request_statement(self, account_id, month):
        self._account(account_id)
        return f"Statement for {account_id} ({month}) emailed."

    def solution(self):
        return [f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>"
                for n, a in self._plan] + ["<answer>done</answer>"]
